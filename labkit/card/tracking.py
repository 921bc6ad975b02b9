"""The card's `tracking` section: where runs are also reported (MLflow, Weights & Biases, TensorBoard). Not
protocol-fixed: reporting never changes a result. Nothing here carries credentials: the card is archived with every
run (MLflow reads them from MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN, W&B from WANDB_API_KEY or `wandb login`)."""

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


class WandbTracking(Strict):
    """Weights & Biases: where the runs go (the API key never: WANDB_API_KEY or `wandb login`)."""

    project: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[^/\\#?%:]+$",
                                description="the W&B project (default: the experiment.id)")
    entity: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[^/\\#?%:]+$",
                               description="the W&B team or user (default: the API key's default entity)")


class Tracking(Strict):
    """Where runs are also reported (off by default); not protocol-fixed: tracking never changes a result."""

    mlflow: MlflowTracking | None = Field(default=None, description="mirror every run into MLflow (one MLflow "
                                          "experiment per experiment.id): hypothesis and verdict, headline metrics, "
                                          "tables, the report, status")
    wandb: bool | WandbTracking = Field(default=False, description="true (or {project, entity}): report every run to "
                                        "Weights & Biases (one W&B project per experiment.id): the trainer's step "
                                        "metrics and the same headline metrics, tables and report as MLflow; "
                                        "WANDB_MODE=offline logs to files only")
    tensorboard: bool = Field(default=False, description="stage 04 writes TensorBoard event files to training/tensorboard")

    def wandb_settings(self) -> WandbTracking | None:
        """The W&B settings when W&B is on (`wandb: true` is the defaults), else None."""
        if self.wandb is True:
            return WandbTracking()
        return self.wandb or None
