"""`ask_human`: the agent asks a colleague a question and goes on with the answer.

The call defers itself as a Pydantic AI question (`CallDeferred(kind="question")`, the kind
Pydantic AI Harness's `AskUser` uses too): the engine opens an inbox item of kind `question`
for it and parks the run; the person's answer (free text, or one of `choices`) is the call's
result the model reads on its next turn. Any tool that raises `CallDeferred(kind="question",
metadata={"question": ..., "choices": [...]})` is asked the same way.
"""

from __future__ import annotations

from pydantic_ai import CallDeferred, ModelRetry

MAX_QUESTION = 2000
MAX_CHOICES = 10
MAX_CHOICE = 200


def checked_question(question: str, tool: str) -> str:
    """The question a tool asks, stripped (checked: the model is told what to fix)."""
    question = question.strip()
    if not question:
        raise ModelRetry(f"{tool} needs a question: say what you want to know")
    if len(question) > MAX_QUESTION:
        raise ModelRetry(f"the question is too long: at most {MAX_QUESTION} characters")
    return question


def question_metadata(question: str, choices: list[str] | None) -> dict:
    """The question as the inbox shows it (checked: the model is told what to fix)."""
    question = checked_question(question, "ask_human")
    if choices is None:
        return {"question": question, "choices": None}
    kept = list(dict.fromkeys(c.strip() for c in choices if c.strip()))
    if len(kept) < 2:
        raise ModelRetry("give at least two distinct choices, or none for a free answer")
    if len(kept) > MAX_CHOICES or any(len(c) > MAX_CHOICE for c in kept):
        raise ModelRetry(f"at most {MAX_CHOICES} choices of at most {MAX_CHOICE} characters")
    return {"question": question, "choices": kept}


def ask_human(question: str, choices: list[str] | None = None) -> str:
    """Ask a colleague (a person on the support team) a question you cannot answer yourself,
    such as whether a policy applies to this case. The run waits until they answer; the answer
    is returned as text. Give `choices` when the answer must be one of a few options.

    Args:
        question: the question, with what the colleague needs to know to answer it.
        choices: the possible answers, if the answer must be one of them.
    """
    raise CallDeferred(question_metadata(question, choices), kind="question")
