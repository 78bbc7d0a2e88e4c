"""The e2e tests' shared real vLLM run (`served`, one `vllm serve` start per session; see
e2e_vllm_run.py)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_vllm_run import Served, serve_traced


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory, session_otlp_receiver: Any) -> Served:
    return serve_traced(tmp_path_factory.mktemp("vllm"), session_otlp_receiver)
