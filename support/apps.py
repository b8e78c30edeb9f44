from django.apps import AppConfig


class SupportConfig(AppConfig):
    name = "support"
    verbose_name = "Support demo"
    default_auto_field = "django.db.models.BigAutoField"
