"""JSON views. ``ATOMIC_REQUESTS`` wraps each in a transaction: an order and its check
job commit together, or neither does (a full queue answers 429, the order rolled back).

Placing and showing an order are public and act as nobody. Approving one acts as the staff
user logged in (the session of ``/admin/login/``), who needs the ``durable_jobs.approve_job``
permission, is recorded as the approver (never a name the body gives), and must send
Django's CSRF token (the ``csrftoken`` cookie's value in an ``X-CSRFToken`` header)."""

import json

from django.db import router
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import jobs
import jobs.contrib.django
from orders.models import Order


@csrf_exempt  # public and anonymous: it uses no session, so there is nothing to forge
@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body or b"{}")
    order = Order.objects.create(customer=body["customer"], total_cents=body["total_cents"])
    order.job_id = jobs.contrib.django.submit(
        "check_shop_order", {"order_id": order.pk}, using=router.db_for_write(Order)
    )
    order.save(update_fields=["job_id"])
    if body.get("fail_after_submit"):
        raise RuntimeError("failed after the submit: the order and its job roll back")
    return JsonResponse({"order_id": order.pk, "job_id": order.job_id}, status=201)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> HttpResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    job = jobs.get(order.job_id)
    return JsonResponse(
        {
            "order_id": order.pk,
            "checked": order.checked,
            "job": {"id": job.id, "state": job.state.value, "result": job.result},
        }
    )


@require_POST
def approve_order(request: HttpRequest, order_id: int) -> HttpResponse:
    if not request.user.is_authenticated:
        return JsonResponse({"error": "log in first (/admin/login/)"}, status=401)
    if not request.user.has_perm("durable_jobs.approve_job"):
        return JsonResponse({"error": "approving needs durable_jobs.approve_job"}, status=403)
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    try:
        job = jobs.approve(order.job_id, by=request.user.get_username())
    except jobs.IllegalTransition as err:
        return JsonResponse({"error": str(err)}, status=409)
    return JsonResponse({"job": {"id": job.id, "state": job.state.value}})
