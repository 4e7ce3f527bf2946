"""The autoshard plan service: a REST API over the planner (`create_app` in `service.app`)."""
