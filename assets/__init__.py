"""The build stages of a pack, one module per stage, each a partitioned Dagster asset."""

import warnings

from dagster import PreviewWarning

# Checks are partitioned per pack, a Dagster 1.13 preview feature this project relies on.
warnings.filterwarnings("ignore", category=PreviewWarning)
