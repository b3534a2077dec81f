"""hcqr-dspy: Hypothesis-Conditioned Query Rewriting (HCQR) as DSPy programs.

HCQR forms a working hypothesis from a multiple-choice question, rewrites it
into three retrieval queries (support, distinction, key features), retrieves
with all three through one shared retriever, fuses the hits into a fixed
budget and answers from question + options + context only.

The toolkit is offline by design: importing it turns MLflow's usage telemetry off
(``MLFLOW_DISABLE_TELEMETRY=true``) unless the variable is already set; set it to
``false`` to let MLflow send its telemetry.
"""

import os

from hcqr_dspy.errors import HCQRError

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

__version__ = "0.1.0"
__all__ = ["HCQRError", "__version__"]
