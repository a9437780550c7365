"""`python -m export`: export a checkpoint to an ONNX bundle."""

import sys

from export.onnx_export import main

sys.exit(main())
