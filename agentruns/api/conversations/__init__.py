"""The API of conversations: threads of runs (issue 33; the chat endpoint is `api/chat.py`)."""
