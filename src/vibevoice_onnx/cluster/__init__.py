"""Beyond one process: batch synthesis and transcription as Ray Data jobs (the `cluster` extra installs Ray).

    run_job("synthesize", "onnx/realtime/cpu_int8", "items.jsonl", "out", workers=2)
"""
