"""Who may do what, and how much: the permission snapshot and the quotas."""
