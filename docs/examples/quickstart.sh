# The quickstart, run verbatim by tests/test_docs.py in a fresh folder holding shop_jobs.py.
set -eu
# --8<-- [start:run]
export JOBS_IMPORTS=shop_jobs     # the modules that define your job kinds
jobctl worker --pool solo --hostname A@%h > worker-a.log 2>&1 &
WORKER_A=$!
jobctl sweeper > sweeper.log 2>&1 &
SWEEPER=$!
# --8<-- [end:run]

# --8<-- [start:submit]
jobctl submit receipt --input '{"order_id": 42}' --wait --timeout 120
# --8<-- [end:submit]

# --8<-- [start:crash]
ID=$(jobctl submit receipt --input '{"order_id": 43}')
# wait until fetch_order is recorded and send_receipt runs, then kill the worker
until jobctl show "$ID" | grep -q "^  fetch_order "; do sleep 0.5; done
kill -9 "$WORKER_A"
jobctl worker --pool solo --hostname B@%h > worker-b.log 2>&1 &
WORKER_B=$!
until jobctl show "$ID" | grep -q "^state: *COMPLETED"; do sleep 0.5; done
jobctl show "$ID"
# --8<-- [end:crash]

# --8<-- [start:stop]
kill "$WORKER_B" "$SWEEPER"
# --8<-- [end:stop]
