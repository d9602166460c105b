# One image per service from one file:
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=dispatch -t atmosphere-dispatch .
# and one per runtime pool: dispatch with a runtime adapter and its framework (RUNTIME, empty by
# default), which no other image holds (a framework's crash or vulnerability touches its pool only):
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=dispatch \
#     --build-arg RUNTIME=langchain -t atmosphere-dispatch-langchain .
ARG PYTHON_VERSION=3.11

# Only the workspace members' pyproject.toml files, in their folders: what the third-party
# layer below depends on. A code change re-runs this stage, but its output (and so the COPY of
# it, checksummed by content) stays the same, and the dependencies are not installed again.
FROM python:${PYTHON_VERSION}-slim AS manifests
COPY libs /manifests/libs
COPY services /manifests/services
RUN find /manifests -type f ! -name pyproject.toml -delete && find /manifests -type d -empty -delete

FROM python:${PYTHON_VERSION}-slim AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /bin/
ARG SERVICE
# The runtime pool's adapter, `atmosphere-ai-runtime-${RUNTIME}` (langchain, langgraph, pydantic-ai,
# openai-agents, anthropic, cohere, adk, agentscope; or one of PINNED_RUNTIMES); only dispatch runs one.
ARG RUNTIME=""
# The adapters whose frameworks pin what the workspace has left behind: their pools install
# dispatch and the adapter from the pinned environment's lock (envs/pinned, a group per adapter).
ARG PINNED_RUNTIMES="crewai semantic-kernel llamaindex"
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /app
RUN if [ -n "$RUNTIME" ] && [ "$SERVICE" != "dispatch" ]; then \
        echo "RUNTIME=$RUNTIME: a runtime pool is a dispatch (SERVICE=dispatch), not $SERVICE" >&2; exit 1; \
    fi
# Ingress's protocol doors (MCP, A2A, AG-UI), the sandbox's MCP client and dispatch's A2A client
# (remote delegation) are extras of their distributions: those images install them all (a pinned
# pool's does not).
# Third-party dependencies first, in a layer of their own: it changes only with a lock or a
# member's declared dependencies.
COPY pyproject.toml uv.lock ./
COPY envs envs
COPY --from=manifests /manifests ./
RUN --mount=type=cache,target=/root/.cache/uv \
    if [ -n "$RUNTIME" ] && echo " $PINNED_RUNTIMES " | grep -q " $RUNTIME "; then \
        uv sync --frozen --no-install-local --project envs/pinned --no-default-groups --group ${RUNTIME}; \
    else \
        uv sync --frozen --no-dev --no-install-workspace --package atmosphere-ai-${SERVICE} \
            ${RUNTIME:+--package atmosphere-ai-runtime-${RUNTIME}} $(case "$SERVICE" in (ingress|sandbox|dispatch) echo --all-extras;; esac); \
    fi
# Then the workspace itself: a code change rebuilds only this.
COPY libs libs
COPY services services
RUN --mount=type=cache,target=/root/.cache/uv \
    if [ -n "$RUNTIME" ] && echo " $PINNED_RUNTIMES " | grep -q " $RUNTIME "; then \
        uv sync --frozen --no-editable --project envs/pinned --no-default-groups --group ${RUNTIME}; \
    else \
        uv sync --frozen --no-dev --no-editable --package atmosphere-ai-${SERVICE} \
            ${RUNTIME:+--package atmosphere-ai-runtime-${RUNTIME}} $(case "$SERVICE" in (ingress|sandbox|dispatch) echo --all-extras;; esac); \
    fi

FROM python:${PYTHON_VERSION}-slim
ARG SERVICE
ENV SERVICE=${SERVICE} \
    PATH=/app/.venv/bin:${PATH} \
    ATMOSPHERE_APP_DIR=/app \
    ATMOSPHERE_DATA_DIR=/data
# The sandbox isolates `code_exec` with bubblewrap; it reports INACTIVE(<reason>) where the
# cluster forbids the user namespaces bubblewrap needs (and without it the tool is never offered).
RUN if [ "$SERVICE" = "sandbox" ]; then \
        apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /app/.venv /app/.venv
COPY examples /app/examples
# uid and gid 10001, as the pods' securityContext and compose's `user:` say. /data belongs to it,
# so that a new named volume (compose) starts out writable; Kubernetes' fsGroup does that for PVCs.
RUN groupadd --gid 10001 atmosphere \
    && useradd --uid 10001 --gid 10001 --no-create-home atmosphere \
    && mkdir /data && chown 10001:10001 /data
USER 10001:10001
WORKDIR /app
# Exec-form CMD does not expand variables; `exec` hands signals straight to Python.
CMD ["sh", "-c", "exec python -m atmosphere.$SERVICE"]
