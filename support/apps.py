from django.apps import AppConfig


class SupportConfig(AppConfig):
    name = "support"
    verbose_name = "Support demo"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # the desk's pages in the layout's navigation, as any domain app adds its own
        from agentruns.web.layout.navigation import register_nav_link, register_record_page

        register_nav_link(
            "Tickets",
            "ticket-queue",
            permission="support.view_ticket",
            active_names=("ticket-queue", "ticket-detail"),
            # support staff (whoever may see the desk: approvers, trainees, viewers, leads)
            # land on the queue when they sign in
            home=True,
        )
        # a run's or an inbox item's ticket links to the ticket's page
        register_record_page("ticket_id", "ticket-detail")
