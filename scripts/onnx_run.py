"""Runs an ONNX file in onnxruntime on raw little-endian inputs, for tests/deployment/onnx.rs.

    python3 scripts/onnx_run.py MODEL.onnx OUT_DIR NAME=FILE ...

Each FILE holds one input's values (float32 or int64, as the model declares), rows × columns in row
order; each output is written to OUT_DIR/NAME.f32 (float32, row order). Prints the runtime version.
"""
import os
import sys

import numpy as np
import onnxruntime as ort

model, out_dir, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
declared = {i.name: i for i in session.get_inputs()}
feeds = {}
for spec in specs:
    name, path = spec.split("=", 1)
    info = declared[name]
    dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64}[info.type]
    values = np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<"))
    feeds[name] = values.reshape(-1, info.shape[1]) if len(info.shape) == 2 else values
missing = set(declared) - set(feeds)
if missing:
    sys.exit(f"inputs not given: {sorted(missing)}")
for output, values in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
    np.asarray(values, dtype="<f4").tofile(os.path.join(out_dir, f"{output}.f32"))
print(f"onnxruntime {ort.__version__}")
