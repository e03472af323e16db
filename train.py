"""Train a Keras model on several devices: `python train.py --model vgg16 --gpus 4`.

See `python train.py --help` and the README. All the work is in `tf_spectrain.app.cli`.
"""

import sys

from tf_spectrain.app.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main())
