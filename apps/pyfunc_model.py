"""Models-from-code entry of the registered pyfunc: MLflow runs this file to build the model when loading it.

Keeping the class in :mod:`apps.serving` (installed with the project) and only naming it here means the
registry stores code, not a pickled object, so a model registered today loads with tomorrow's fixed code.
"""

import mlflow

from apps.serving import CXRClassifierModel

mlflow.models.set_model(CXRClassifierModel())
