"""Child process of conftest's `keras_only` fixture: loads saved models with Keras alone.

    python tests/keras_only_child.py

Imports Keras (and so TensorFlow) once, never tf_spectrain, then answers one request per
line of standard input, a JSON object `{"model": PATH, "x": NPY_PATH, "out": NPY_PATH}`:
loads the model with `keras.models.load_model`, saves its predictions for the array in
`x` to `out`, and prints one JSON line `{"shape": [...], "tf_spectrain": [modules]}` (the
tf_spectrain modules this process holds, which must be none), or `{"error": TEXT}`. Ends
at the end of its input.
"""

import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main():
    import keras
    import numpy as np

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            model = keras.models.load_model(request["model"])
            out = model.predict(np.load(request["x"]), verbose=0)
            np.save(request["out"], out)
            answer = {"shape": list(out.shape),
                      "tf_spectrain": sorted(m for m in sys.modules
                                             if m.startswith("tf_spectrain"))}
        except Exception:  # reported to the test, which fails on it
            answer = {"error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
