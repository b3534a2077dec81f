"""The code of the MLflow pyfunc model of a saved program ("models from code": nothing is pickled).

MLflow runs this file when it loads a model logged by :func:`hcqr_dspy.tracking.serving.log_program_model`
(``mlflow models serve``, ``mlflow.pyfunc.load_model``); the package never imports it.
"""

import mlflow

from hcqr_dspy.tracking.serving import python_model

mlflow.models.set_model(python_model())
