from django.urls import path

from agentruns.web import threads, views
from agentruns.web.layout import navigation

urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("new/", views.run_new, name="run-new"),
    path("nav/", navigation.nav_counts_fragment, name="nav-counts"),
    path("<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("<uuid:run_id>/retry/", views.run_retry, name="run-retry"),
    path("<uuid:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("<uuid:run_id>/stop/", views.run_stop, name="run-stop"),
    path("<uuid:run_id>/fork/", views.run_fork, name="run-fork"),
    path("<uuid:run_id>/thread/", threads.thread_message, name="run-thread-message"),
    path("steps/<uuid:step_id>/resolve/", views.step_resolve, name="step-resolve"),
]
