"""The quantize command's option texts and defaults, light to import (the CLI's help)."""

from __future__ import annotations

# the tries the mixed-precision fallback may make (the stem's recipes, the parts, the
# leading shares): a count, not seconds, so that the model written does not depend on the
# machine's load; 24 is above what its own limits allow (2 stem recipes, 16 parts, 4 shares
# and the comparison with none), so by default those limits stop it
FALLBACK_TRIES = 24
KEYS_HELP = (
    "floors: top1=99% (top-1 agreement with the float model >= 99% where an output "
    "scores classes), sqnr=25 (SQNR >= 25 dB on every output), iou=90% (the IoU of the "
    "pixels above 0.5 of a map a Sigmoid makes >= 90%), cer=1% (a ceiling: the character "
    "error rate of a CTC-like output's greedy-decoded text against the float model's <= 1%), "
    "cos=0.99 (an embedding's cosine to the float model's, pooled over the attention mask "
    "and normalised, mean >= 0.99), ppl=5% (a ceiling, off by default: a decoder's perplexity "
    "at most 5% above the float model's), joined with commas; auto (top1=99% where classes, "
    "iou=90% where a Sigmoid makes a map, cer=1% where an output is CTC-like, cos=0.99 where "
    "an output is an embedding, top1=99% next-token agreement on a decoder's logits, sqnr=20 "
    "elsewhere) or off"
)
RECIPE_HELP = (
    "auto (try the recipes that apply, keep the most accurate on a validation part of the "
    "calibration data), or steps joined by commas: ranges minmax|mean-minmax|percentile|"
    "mse, cle, smoothquant, float-decomposed, float-requant, float-stem, dynamic (the MatMuls "
    "with constant weights dynamic int8, convolutions static), int4 (weight-only: the "
    "MatMuls' constant weights 4-bit in blocks of 32, everything else float; tried by auto "
    "on decoders only), int8-weights (the same at 8 bits), bias-correction|bias-correction-full"
)
