"""opfuse quantize: the exact fusions first, then static QDQ int8 quantization, the
accuracy gate and the measured speed; ``kernels`` reads how much of a quantized model
onnxruntime runs in integer kernels."""
