"""Ingress: the delay topics consumed, valid records stored in Redis, the rest dead-lettered."""

from bridge.ingress.consumer import Ingress

__all__ = ["Ingress"]
