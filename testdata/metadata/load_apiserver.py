"""Loads incidents.json into an empty kube-apiserver (no controllers, no
kubelet), so that `kubectl get pods,services,endpointslices -A -o json`
prints apiserver.json. Usage: KUBECONFIG=... python3 load_apiserver.py"""
import json, os, subprocess, datetime, time
K = ["kubectl", "--kubeconfig", os.environ["KUBECONFIG"]]
def kc(args, data=None):
    r = subprocess.run(K + args, input=json.dumps(data) if data is not None else None, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"kubectl {args}: {r.stderr}")
    return r.stdout
items = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "incidents.json")))["items"]
for ns in ["kube-flannel", "monitoring"]:
    kc(["create", "namespace", ns])
sas = {("default", "default"), ("kube-system", "default")}
for it in items:
    if it["kind"] == "Pod":
        sas.add((it["metadata"]["namespace"], it["spec"].get("serviceAccountName", "default")))
for ns, sa in sorted(sas):
    subprocess.run(K + ["create", "serviceaccount", "-n", ns, sa], capture_output=True)
def clean(o):
    o = json.loads(json.dumps(o))
    for k in ["uid", "resourceVersion", "creationTimestamp", "generation"]:
        o["metadata"].pop(k, None)
    o.pop("status", None)
    return o
now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
ts = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")
pods = [i for i in items if i["kind"] == "Pod"]
# The Job pod first and finished; the client that reuses its IP later.
pods.sort(key=lambda p: p["metadata"]["name"].startswith("client-"))
for p in pods:
    if p["metadata"]["name"].startswith("client-"):
        time.sleep(2)
    kc(["create", "-f", "-"], clean(p))
    st = p["status"]
    for k in ["conditions", "startTime"]:
        st.pop(k, None)
    for cs in st.get("containerStatuses", []):
        t = cs["state"].get("terminated")
        if t:
            t["startedAt"] = ts(now); t["finishedAt"] = ts(now)
        if "running" in cs["state"]:
            cs["state"]["running"]["startedAt"] = ts(now)
    kc(["patch", "pod", "-n", p["metadata"]["namespace"], p["metadata"]["name"], "--subresource=status", "--type=merge", "-p", json.dumps({"status": st})])
for s in [i for i in items if i["kind"] == "Service"]:
    if s["metadata"]["name"] == "kubernetes":
        continue
    kc(["create", "-f", "-"], clean(s))
    if s["status"].get("loadBalancer"):
        kc(["patch", "service", "-n", s["metadata"]["namespace"], s["metadata"]["name"], "--subresource=status", "--type=merge", "-p", json.dumps({"status": s["status"]})])
for e in [i for i in items if i["kind"] == "EndpointSlice"]:
    if e["metadata"]["name"] == "kubernetes":
        continue
    o = clean(e)
    o["metadata"].pop("ownerReferences", None)  # the Services' real UIDs differ
    kc(["create", "-f", "-"], o)
print("loaded")
