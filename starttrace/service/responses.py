"""The service's JSON response: strict JSON (`views.json.dumps`), so that a NaN or an infinity in
a run's data answers null instead of a 500 (Starlette's own refuses them) or bare `NaN` (which
browsers refuse)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from starttrace.views.json import dumps


class StrictJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content).encode()
