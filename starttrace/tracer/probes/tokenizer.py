"""Tokenizer probe: span `tokenizer.load` (phase `tokenizer`) around Hugging Face's
`AutoTokenizer.from_pretrained` and `PreTrainedTokenizerBase.from_pretrained` (one span when one
calls the other), in every process that loads a tokenizer: vLLM's API server and engine core load
theirs through them. Standard library only.
"""

from starttrace.tracer import recorder
from starttrace.tracer.probes._wrap import note, note_missing, patch, publish_probe_list, traced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SPAN = "tokenizer.load"
TARGETS = (
    ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase"),
    ("transformers.models.auto.tokenization_auto", "AutoTokenizer"),
)


def install() -> None:
    for module, klass in TARGETS:
        recorder.when_imported(module, _patcher(klass))


def _name_of(args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> "dict[str, Any] | None":
    # from_pretrained(cls, pretrained_model_name_or_path, ...)
    name = args[1] if len(args) > 1 else kwargs.get("pretrained_model_name_or_path")
    return {"starttrace.tokenizer.name": str(name)[:300]} if name is not None else None


def _tokenizer_class(result: "Any") -> "dict[str, Any] | None":
    return {"starttrace.tokenizer.class": type(result).__name__}


def _patcher(class_name: str) -> "Any":
    def patch_module(module: "Any") -> None:
        label = f"{module.__name__}.{class_name}.from_pretrained"
        klass = getattr(module, class_name, None)
        if klass is None:
            note_missing(label)
        else:
            note(
                label,
                patch(
                    klass,
                    "from_pretrained",
                    lambda fn: traced(
                        fn,
                        SPAN,
                        "tokenizer",
                        {"code.function": label},
                        _name_of,
                        lambda args, kwargs, result: _tokenizer_class(result),
                    ),
                ),
            )
        publish_probe_list()

    return patch_module
