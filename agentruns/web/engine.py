"""The template engine: Django's, with every rendered page made encodable.

A stored row can hold text that UTF-8 cannot encode (a lone surrogate in JSON on SQLite, from
before the API refused it). Rendered as is, it makes the response fail to encode, a 500 for
every user who opens that page (the inbox, the run page, the admin). Every render goes through
`agentruns.runtime.values.text.printable`, so such a character shows as U+FFFD and the page still works.
"""

from __future__ import annotations

from typing import Any

from django.template.backends.django import DjangoTemplates
from django.utils.safestring import SafeString, mark_safe

from agentruns.runtime.values.text import printable


class EncodableTemplate:
    def __init__(self, template: Any) -> None:
        self.template_impl = template

    def render(self, context: Any = None, request: Any = None) -> SafeString:
        return mark_safe(printable(self.template_impl.render(context, request)))

    def __getattr__(self, name: str) -> Any:  # origin, template, ... as Django's has them
        return getattr(self.template_impl, name)


class EncodableTemplates(DjangoTemplates):
    def from_string(self, template_code: str) -> EncodableTemplate:
        return EncodableTemplate(super().from_string(template_code))

    def get_template(self, template_name: str) -> EncodableTemplate:
        return EncodableTemplate(super().get_template(template_name))
