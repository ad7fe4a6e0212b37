"""The ``openai`` backend: any OpenAI-compatible ``/chat/completions`` endpoint, via httpx.

llama.cpp's server, Ollama, vLLM or a hosted service: JSON-schema-constrained output
(``response_format``), temperature 0, one request, no retries, a wall-clock timeout over the
whole exchange.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from evidence_pipeline.authoring.backends.base import (
    DEFAULT_TIMEOUT_S,
    ModelBackendError,
    ModelReply,
    ModelRequest,
    bounded,
    build_prompt,
    read_settings,
    reply_json_schema,
    system_prompt,
)
from evidence_pipeline.authoring.backends.reply_text import (
    check_reply_size,
    decode_reply,
    read_reply,
)
from evidence_runtime.errors import ConfigError

DEFAULT_API_KEY_ENV = "THT_LLM_API_KEY"


class OpenAISettings(BaseModel):
    """Settings of the ``openai`` backend (``thoth.yaml`` ``model:``)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None  # e.g. http://127.0.0.1:8080/v1; default $THT_LLM_BASE_URL
    model: str | None = None  # default $THT_LLM_MODEL
    api_key_env: str = DEFAULT_API_KEY_ENV
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)


class OpenAIBackend:
    """Restructures a source with one chat-completion request; no retries."""

    name = "openai"

    def __init__(self, *, base_url: str, model: str, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_tokens: int | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"model base_url {base_url!r} is not an http(s) URL",
                              field="model.base_url")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self._transport = transport

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> OpenAIBackend:
        s = read_settings(OpenAISettings, settings, "openai")
        base_url = s.base_url or os.environ.get("THT_LLM_BASE_URL")
        model = s.model or os.environ.get("THT_LLM_MODEL")
        if not base_url:
            raise ConfigError("the openai backend needs model.base_url (or THT_LLM_BASE_URL)",
                              field="model.base_url")
        if not model:
            raise ConfigError("the openai backend needs model.model (or THT_LLM_MODEL)",
                              field="model.model")
        return cls(base_url=base_url, model=model, api_key=os.environ.get(s.api_key_env) or None,
                   timeout_s=s.timeout_s, max_tokens=s.max_tokens)

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of the chat-completion request for one source."""
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": system_prompt()},
                {"role": "user", "content": build_prompt(request)},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "evidence_units", "schema": reply_json_schema(),
                                "strict": False},
            },
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def restructure(self, request: ModelRequest) -> ModelReply:
        path = request.source_file
        try:
            status, data = asyncio.run(self._post(request))
        except (TimeoutError, httpx.TimeoutException):
            raise ModelBackendError(
                f"no complete answer from {self.url} within {self.timeout_s:g} s (wall clock)",
                code="model_timeout", path=path) from None
        except httpx.ConnectError as exc:
            raise ModelBackendError(f"cannot reach {self.url}: {exc}",
                                    code="model_unreachable", path=path) from None
        except httpx.HTTPError as exc:
            raise ModelBackendError(f"request to {self.url} failed: {exc}",
                                    code="model_http_error", path=path) from None
        if status >= 400:
            text = data.decode("utf-8", errors="replace")  # only shown, in the error
            raise ModelBackendError(f"{self.url} answered HTTP {status}: {bounded(text, 500)}",
                                    code="model_http_error", path=path)
        text = decode_reply(data, path=path, what=f"the answer of {self.url}")
        return read_reply(_completion_content(text, path), request)

    async def _post(self, request: ModelRequest) -> tuple[int, bytes]:
        """One request; the status and the body. ``timeout_s`` bounds the whole exchange
        (connect, headers, body): httpx's own timeouts bound each read, and an endpoint that
        drips its headers or body byte by byte never trips them."""
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout(self.timeout_s), \
                httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s),
                                  transport=self._transport) as client, \
                client.stream("POST", self.url, json=self.request_body(request),
                              headers=headers) as response:
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                check_reply_size(size, "the endpoint answered", path=request.source_file)
            return response.status_code, b"".join(chunks)


def _completion_content(text: str, path: str) -> str:
    def bad(why: str) -> ModelBackendError:
        return ModelBackendError(f"the endpoint's answer is not a chat completion ({why})",
                                 code="model_invalid_output", path=path)

    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        raise bad(f"not JSON: {bounded(text, 200)!r}") from None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad("no choices")
    choice = choices[0]
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if choice.get("finish_reason") == "length":
        raise ModelBackendError("the model reply was cut off (finish_reason=length); raise "
                                "max_tokens or the model's context size",
                                code="model_invalid_output", path=path)
    if not isinstance(content, str):
        refusal = message.get("refusal") if isinstance(message, dict) else None
        raise bad(f"refusal: {bounded(str(refusal), 300)}" if refusal else "no message content")
    return content
