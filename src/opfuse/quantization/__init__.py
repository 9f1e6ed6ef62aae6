"""opfuse quantize: fuse first (the source documents' fusions before quantization), then
static QDQ int8 with onnxruntime.quantization, the exact QDQ clean-up rules, accuracy
measured on held-back samples and gated (the most sensitive layers kept in float when
needed), and the speed measured on this machine.

``calibration`` reads the user's samples, ``preprocess`` turns images into them,
``flow`` runs fuse -> quantize -> clean up, ``accuracy`` compares the int8 model with the
float one, ``gate`` decides and falls back, ``run`` ties them together for the CLI and API;
``kernels`` reads how much of a quantized model onnxruntime runs in integer kernels.
"""
