"""Generation loops, each written once and run on two backends: the PyTorch reference and the onnxruntime
runtime (numpy in, numpy out, no torch here)."""
