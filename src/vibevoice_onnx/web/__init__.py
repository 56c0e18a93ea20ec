"""`vibevoice-onnx web`: a static site that runs a realtime bundle in the browser, on onnxruntime-web (web.site)."""
