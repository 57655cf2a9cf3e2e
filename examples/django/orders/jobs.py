"""The shop's job: check an order (a step that reads it through the ORM), wait for a
human's approval when it is large, then mark it checked."""

from typing import Any

import jobs
from orders.models import Order

APPROVAL_OVER_CENTS = 100_000


def load(order_id: int) -> dict[str, Any]:
    order = Order.objects.get(pk=order_id)
    return {"order_id": order.pk, "total_cents": order.total_cents}


def mark_checked(order_id: int) -> bool:
    return Order.objects.filter(pk=order_id).update(checked=True) == 1


@jobs.job("check_shop_order", max_attempts=3, max_queued=20)
def check_order(ctx: jobs.JobContext, order_id: int) -> dict[str, Any]:
    order = ctx.step("load", load, order_id)
    approved_by = None
    if order["total_cents"] > APPROVAL_OVER_CENTS:
        approved_by = ctx.wait_for_approval("large order")["approved_by"]
    ctx.step("mark_checked", mark_checked, order_id)
    return {"order_id": order_id, "approved_by": approved_by}
