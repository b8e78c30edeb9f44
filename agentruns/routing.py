from django.urls import re_path

from agentruns.stream.consumer import RunStreamConsumer

websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<run_id>[0-9a-fA-F-]{32,36})/$", RunStreamConsumer.as_asgi()),
]
