"""The card's `tracking` section: where runs are also reported (MLflow, TensorBoard). Not protocol-fixed: reporting
never changes a result. A tracking URI carries no credentials: the card is archived with every run."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from labkit.card.experiment_and_data import Strict


class MlflowTracking(Strict):
    uri: str = Field(min_length=1, description="the MLflow tracking URI: a local store (sqlite:///mlflow.db, a folder "
                     "path) or a server (http://host:5000); a relative path is taken from the runs folder")

    @field_validator("uri")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@", value):
            raise ValueError("the URI holds credentials (user:password@), which would be archived with every run: "
                             "write the URI without them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                             "(or MLFLOW_TRACKING_TOKEN) in the environment")
        return value


class Tracking(Strict):
    """Where runs are also reported (off by default); not protocol-fixed: tracking never changes a result."""

    mlflow: MlflowTracking | None = Field(default=None, description="mirror every run into MLflow (one MLflow "
                                          "experiment per experiment.id): card, data version, metrics, status, notebooks")
    tensorboard: bool = Field(default=False, description="stage 04 writes TensorBoard event files to training/tensorboard")
