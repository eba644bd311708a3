"""Light clients for the users of the predictions: schedulers and load balancers (events + kafka-python only)."""

from clients.load_balancer import LoadBalancer, MoveRequest
from clients.scheduler import SchedulerClient

__all__ = ["LoadBalancer", "MoveRequest", "SchedulerClient"]
