"""Verification: run the original and the optimized model under onnxruntime on the same
generated (or given) inputs, judge every output against its tolerance, bisect the passes
when one differs, and say it in lines a user can act on."""
