"""Tests of the HTTP hardening both tiers share (`http_hardening/`); `wire` is their server and raw-socket client."""
