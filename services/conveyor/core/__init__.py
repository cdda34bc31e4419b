"""Shared by every service; never imports api, publisher, worker or maintenance."""
