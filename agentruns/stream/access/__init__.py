"""Who may hold a stream open, and how many: the stream caps, the viewers' rechecks, and SSE
answers held to both as sockets are."""
