"""The quickstart's job: two steps, the second slow enough to crash a worker inside it."""

import time

import jobs


def fetch_order(order_id: int) -> dict:
    print(f"fetching order {order_id}")  # runs once: its output is recorded
    return {"order_id": order_id, "email": "ada@example.com", "total": 42.0}


def send_receipt(order: dict) -> str:
    time.sleep(5)  # long enough to kill the worker in the middle of it
    print(f"receipt sent to {order['email']}")
    return f"receipt for order {order['order_id']}"


@jobs.job("receipt", max_attempts=3)
def receipt(ctx: jobs.JobContext, order_id: int) -> dict:
    order = ctx.step("fetch_order", fetch_order, order_id)
    sent = ctx.step("send_receipt", send_receipt, order)
    return {"sent": sent}
