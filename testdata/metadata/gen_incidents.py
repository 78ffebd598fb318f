"""Writes incidents.json, shaped as `kubectl get pods,services,endpointslices
-A -o json` prints it. Usage: python3 gen_incidents.py > incidents.json"""
import json, hashlib, uuid

def uid(s): return str(uuid.UUID(hashlib.md5(s.encode()).hexdigest()))
def cid(s): return hashlib.sha256(s.encode()).hexdigest()
rv = [412000]
def nrv():
    rv[0] += 37; return str(rv[0])

NODES = {"node-1": "192.168.1.11", "node-2": "192.168.1.12"}
T0 = "2026-11-28T08:14:02Z"

def kube_api_volume(name="kube-api-access-x7k2p"):
    return {"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
        {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}, "path": "namespace"}]}}]}}

def pod(ns, name, node, ip, image, ports=(), owner=None, labels=None, created=T0, host_network=False,
        phase="Running", sa="default", prio=0, prio_class=None, annotations=None, started=None, finished=None, cmd=None):
    host_ip = NODES[node]
    ip = host_ip if host_network else ip
    cname = image.split("/")[-1].split(":")[0]
    meta = {"creationTimestamp": created, "labels": labels or {"app": name.split("-")[0]}, "name": name,
            "namespace": ns, "resourceVersion": nrv(), "uid": uid(ns + "/" + name)}
    if annotations: meta["annotations"] = annotations
    if owner:
        kind, oname = owner
        meta["generateName"] = name[:name.rfind("-") + 1] if kind != "StatefulSet" else None
        if meta["generateName"] is None: del meta["generateName"]
        meta["ownerReferences"] = [{"apiVersion": "batch/v1" if kind == "Job" else "apps/v1", "blockOwnerDeletion": True,
                                    "controller": True, "kind": kind, "name": oname, "uid": uid(kind + oname)}]
    cports = []
    for p in ports:
        cp = {"containerPort": p[1], "name": p[0], "protocol": p[2] if len(p) > 2 else "TCP"}
        if len(p) > 3 and p[3]: cp["hostPort"] = p[3]
        if host_network: cp["hostPort"] = p[1]
        cports.append(dict(sorted(cp.items())))
    container = {"image": image, "imagePullPolicy": "IfNotPresent", "name": cname,
                 "resources": {}, "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "File",
                 "volumeMounts": [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": "kube-api-access-" + cid(name)[:5], "readOnly": True}]}
    if cmd: container["command"] = cmd
    if cports: container["ports"] = cports
    container = dict(sorted(container.items()))
    spec = {"containers": [container], "dnsPolicy": "ClusterFirstWithHostNet" if host_network else "ClusterFirst",
            "enableServiceLinks": True, "nodeName": node, "preemptionPolicy": "PreemptLowerPriority",
            "priority": prio, "restartPolicy": "Never" if phase == "Succeeded" else "Always", "schedulerName": "default-scheduler",
            "securityContext": {}, "serviceAccount": sa, "serviceAccountName": sa,
            "terminationGracePeriodSeconds": 30,
            "tolerations": [{"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300},
                            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300}],
            "volumes": [kube_api_volume("kube-api-access-" + cid(name)[:5])]}
    if host_network: spec["hostNetwork"] = True
    if prio_class: spec["priorityClassName"] = prio_class
    spec = dict(sorted(spec.items()))
    start = started or created.replace(":02Z", ":04Z")
    ready = phase == "Running"
    conds = [
        {"lastProbeTime": None, "lastTransitionTime": start, "status": "True" if ready else "False", "type": "PodReadyToStartContainers"},
        {"lastProbeTime": None, "lastTransitionTime": created, "status": "True", "type": "Initialized"},
        {"lastProbeTime": None, "lastTransitionTime": start, "status": "True" if ready else "False", "type": "Ready", **({} if ready else {"reason": "PodCompleted"})},
        {"lastProbeTime": None, "lastTransitionTime": start, "status": "True" if ready else "False", "type": "ContainersReady", **({} if ready else {"reason": "PodCompleted"})},
        {"lastProbeTime": None, "lastTransitionTime": created, "status": "True", "type": "PodScheduled"}]
    if ready:
        state = {"running": {"startedAt": start}}
    else:
        state = {"terminated": {"containerID": "containerd://" + cid(ns + name + "c"), "exitCode": 0, "finishedAt": finished,
                                "reason": "Completed", "startedAt": start}}
    cs = {"allocatedResources": {}, "containerID": "containerd://" + cid(ns + name + "c"), "image": image,
          "imageID": image.split(":")[0] + "@sha256:" + cid(image), "lastState": {}, "name": cname,
          "ready": ready, "resources": {}, "restartCount": 0, "started": ready, "state": state,
          "volumeMounts": [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": "kube-api-access-" + cid(name)[:5], "readOnly": True, "recursiveReadOnly": "Disabled"}]}
    del cs["allocatedResources"]; del cs["resources"]
    status = {"conditions": conds, "containerStatuses": [cs], "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
              "phase": phase, "podIP": ip, "podIPs": [{"ip": ip}], "qosClass": "BestEffort", "startTime": created}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": dict(sorted(meta.items())), "spec": spec, "status": status}

def svc(ns, name, cluster_ip, ports, typ="ClusterIP", selector=None, etp=None, lb=None, external=None, hc=None, created=T0, labels=None, annotations=None):
    meta = {"creationTimestamp": created, "name": name, "namespace": ns, "resourceVersion": nrv(), "uid": uid("svc" + ns + name)}
    if labels: meta["labels"] = labels
    if annotations: meta["annotations"] = annotations
    sp = []
    for p in ports:
        d = {"name": p[0], "port": p[1], "protocol": p[2], "targetPort": p[3]}
        if len(p) > 4: d["nodePort"] = p[4]
        sp.append(dict(sorted(d.items())))
    spec = {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "internalTrafficPolicy": "Cluster",
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "ports": sp, "sessionAffinity": "None", "type": typ}
    if selector: spec["selector"] = selector
    if typ in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = etp or "Cluster"
    if typ == "LoadBalancer":
        spec["allocateLoadBalancerNodePorts"] = True
    if hc: spec["healthCheckNodePort"] = hc
    if external: spec["externalIPs"] = external
    status = {"loadBalancer": {}}
    if lb: status["loadBalancer"] = {"ingress": [{"ip": lb, "ipMode": "VIP"}]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": dict(sorted(meta.items())), "spec": dict(sorted(spec.items())), "status": status}

def eps(ns, svcname, pods, ports, suffix, created=T0):
    e = []
    for p in pods:
        e.append({"addresses": [p["status"]["podIP"]], "conditions": {"ready": True, "serving": True, "terminating": False},
                  "nodeName": p["spec"]["nodeName"],
                  "targetRef": {"kind": "Pod", "name": p["metadata"]["name"], "namespace": ns, "uid": p["metadata"]["uid"]}})
    meta = {"annotations": {"endpoints.kubernetes.io/last-change-trigger-time": created}, "creationTimestamp": created,
            "generateName": svcname + "-", "generation": 1 + len(pods),
            "labels": {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io", "kubernetes.io/service-name": svcname},
            "name": svcname + "-" + suffix, "namespace": ns,
            "ownerReferences": [{"apiVersion": "v1", "blockOwnerDeletion": True, "controller": True, "kind": "Service", "name": svcname, "uid": uid("svc" + ns + svcname)}],
            "resourceVersion": nrv(), "uid": uid("eps" + ns + svcname)}
    out = {"addressType": "IPv4", "apiVersion": "discovery.k8s.io/v1", "endpoints": e if e else None, "kind": "EndpointSlice",
           "metadata": meta, "ports": [{"name": p[0], "port": p[1], "protocol": p[2]} for p in ports]}
    if not e: del out["endpoints"]
    return out

pods = {}
def P(*a, **k):
    p = pod(*a, **k); pods[p["metadata"]["name"]] = p; return p

# kube-system
P("kube-system", "coredns-7c65d6cfc9-4vxkq", "node-1", "10.244.2.2", "registry.k8s.io/coredns/coredns:v1.11.3",
  ports=[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"), ("metrics", 9153, "TCP")], owner=("ReplicaSet", "coredns-7c65d6cfc9"),
  labels={"k8s-app": "kube-dns", "pod-template-hash": "7c65d6cfc9"}, sa="coredns", prio=2000000000, prio_class="system-cluster-critical")
P("kube-system", "coredns-7c65d6cfc9-m2rtd", "node-2", "10.244.1.2", "registry.k8s.io/coredns/coredns:v1.11.3",
  ports=[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"), ("metrics", 9153, "TCP")], owner=("ReplicaSet", "coredns-7c65d6cfc9"),
  labels={"k8s-app": "kube-dns", "pod-template-hash": "7c65d6cfc9"}, sa="coredns", prio=2000000000, prio_class="system-cluster-critical")
for n, suf in (("node-1", "8xq4d"), ("node-2", "tq9wz")):
    P("kube-system", "kube-proxy-" + suf, n, None, "registry.k8s.io/kube-proxy:v1.31.4", owner=("DaemonSet", "kube-proxy"),
      labels={"controller-revision-hash": "6b6d9b8c5f", "k8s-app": "kube-proxy", "pod-template-generation": "1"},
      host_network=True, sa="kube-proxy", prio=2000001000, prio_class="system-node-critical", cmd=["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"])
    P("kube-flannel", "kube-flannel-ds-" + suf[::-1], n, None, "docker.io/flannel/flannel:v0.26.1", owner=("DaemonSet", "kube-flannel-ds"),
      labels={"app": "flannel", "controller-revision-hash": "7d5f7b9c8d", "pod-template-generation": "1", "tier": "node"},
      host_network=True, sa="flannel", prio=2000001000, prio_class="system-node-critical")
    # Incident 2: a hostNetwork DaemonSet listening on :80 that declares no
    # port (so the scheduler does not see it), and node-exporter which does.
    P("kube-system", "edge-proxy-" + suf[:3] + "k7", n, None, "registry.example.com/edge-proxy:2.4.1", owner=("DaemonSet", "edge-proxy"),
      labels={"app": "edge-proxy", "controller-revision-hash": "5f7c9d8b6", "pod-template-generation": "3"}, host_network=True)
    P("monitoring", "node-exporter-" + suf[1:] + "b", n, None, "quay.io/prometheus/node-exporter:v1.8.2", owner=("DaemonSet", "node-exporter"),
      labels={"app": "node-exporter", "controller-revision-hash": "84c6bd5b9", "pod-template-generation": "1"}, host_network=True,
      ports=[("metrics", 9100, "TCP")])

# Incident 1: mysql-a on node-1, mysql-b on node-2 (the traced node) with hostPort 3306.
P("default", "mysql-a-0", "node-1", "10.244.2.7", "docker.io/library/mysql:8.0.40", ports=[("mysql", 3306, "TCP")],
  owner=("StatefulSet", "mysql-a"), labels={"app": "mysql-a", "apps.kubernetes.io/pod-index": "0", "controller-revision-hash": "mysql-a-6c9f8d7b5", "statefulset.kubernetes.io/pod-name": "mysql-a-0"})
P("default", "mysql-b-0", "node-2", "10.244.1.5", "docker.io/library/mysql:8.0.40", ports=[("mysql", 3306, "TCP", 3306)],
  owner=("StatefulSet", "mysql-b"), labels={"app": "mysql-b", "apps.kubernetes.io/pod-index": "0", "controller-revision-hash": "mysql-b-7d8c9b6f4", "statefulset.kubernetes.io/pod-name": "mysql-b-0"})
# Clients: one per node. A finished Job pod held 10.244.1.7 before the client.
P("default", "app-5d8f7c9b4-x2x9q", "node-1", "10.244.2.9", "registry.example.com/app:1.14.2", ports=[("http", 8080, "TCP")],
  owner=("ReplicaSet", "app-5d8f7c9b4"), labels={"app": "app", "pod-template-hash": "5d8f7c9b4"})
P("default", "db-migrate-29411520-7bq4l", "node-2", "10.244.1.7", "registry.example.com/app:1.14.2",
  owner=("Job", "db-migrate-29411520"), labels={"batch.kubernetes.io/job-name": "db-migrate-29411520", "job-name": "db-migrate-29411520"},
  created="2026-11-28T07:00:02Z", phase="Succeeded", finished="2026-11-28T07:00:41Z", cmd=["/app", "migrate"])
P("default", "client-6b7d9c5f8-kq2lm", "node-2", "10.244.1.7", "docker.io/library/busybox:1.37", owner=("ReplicaSet", "client-6b7d9c5f8"),
  labels={"app": "client", "pod-template-hash": "6b7d9c5f8"}, created="2026-11-28T08:20:15Z", cmd=["sleep", "infinity"])
# nginx behind a NodePort; seed 000's experiment gives a second pod hostPort 30080.
P("default", "nginx-7c5ddbdf54-p8lwz", "node-2", "10.244.1.6", "docker.io/library/nginx:1.27.3", ports=[("http", 80, "TCP")],
  owner=("ReplicaSet", "nginx-7c5ddbdf54"), labels={"app": "nginx", "pod-template-hash": "7c5ddbdf54"})
P("default", "nginx-hostport-0", "node-2", "10.244.1.8", "docker.io/library/nginx:1.27.3", ports=[("http", 80, "TCP", 30080)],
  owner=("StatefulSet", "nginx-hostport"), labels={"app": "nginx-hostport", "statefulset.kubernetes.io/pod-name": "nginx-hostport-0"})
# Incident 2's hostPort 80 pod, next to edge-proxy's listener.
P("default", "echo-hostport-66b9d4c7f8-w5n2c", "node-2", "10.244.1.10", "registry.k8s.io/e2e-test-images/agnhost:2.53",
  ports=[("http", 8080, "TCP", 80)], owner=("ReplicaSet", "echo-hostport-66b9d4c7f8"), labels={"app": "echo-hostport", "pod-template-hash": "66b9d4c7f8"})
# Incident 4: web behind an ETP=Local LoadBalancer, only on node-1.
P("default", "web-6f4b8d9c7-t4hzp", "node-1", "10.244.2.8", "registry.example.com/web:3.2.0", ports=[("http", 8080, "TCP")],
  owner=("ReplicaSet", "web-6f4b8d9c7"), labels={"app": "web", "pod-template-hash": "6f4b8d9c7"})
P("default", "legacy-api-0", "node-1", "10.244.2.10", "registry.example.com/legacy-api:0.9", ports=[("http", 8080, "TCP")],
  owner=("StatefulSet", "legacy-api"), labels={"app": "legacy-api", "statefulset.kubernetes.io/pod-name": "legacy-api-0"})

services = [
    svc("default", "kubernetes", "10.96.0.1", [("https", 443, "TCP", 6443)], labels={"component": "apiserver", "provider": "kubernetes"}, created="2026-11-01T10:00:00Z"),
    svc("kube-system", "kube-dns", "10.96.0.10", [("dns", 53, "UDP", 53), ("dns-tcp", 53, "TCP", 53), ("metrics", 9153, "TCP", 9153)],
        selector={"k8s-app": "kube-dns"}, labels={"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
        annotations={"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}),
    svc("default", "mysql-a", "10.96.0.20", [("mysql", 3306, "TCP", 3306)], selector={"app": "mysql-a"}),
    svc("default", "mysql-b", "10.96.0.21", [("mysql", 3306, "TCP", 3306)], selector={"app": "mysql-b"}),
    svc("default", "mysql-a-headless", "None", [("mysql", 3306, "TCP", 3306)], selector={"app": "mysql-a"}),
    svc("default", "nginx", "10.96.0.40", [("http", 80, "TCP", 80, 30080)], typ="NodePort", selector={"app": "nginx"}),
    svc("default", "web", "10.96.0.30", [("http", 80, "TCP", 8080, 30081)], typ="LoadBalancer", selector={"app": "web"}, etp="Local", lb="192.168.1.200", hc=32000),
    svc("default", "legacy-api", "10.96.0.50", [("http", 8080, "TCP", "http")], selector={"app": "legacy-api"}, external=["192.168.1.250"]),
]
for s in services:
    if s["spec"]["clusterIP"] == "None":
        s["spec"]["clusterIPs"] = ["None"]

slices = [
    {"addressType": "IPv4", "apiVersion": "discovery.k8s.io/v1", "endpoints": [{"addresses": ["192.168.1.11"], "conditions": {"ready": True, "serving": True, "terminating": False}}],
     "kind": "EndpointSlice", "metadata": {"creationTimestamp": "2026-11-01T10:00:00Z", "generation": 1, "labels": {"kubernetes.io/service-name": "kubernetes"},
     "name": "kubernetes", "namespace": "default", "resourceVersion": nrv(), "uid": uid("epskubernetes")}, "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]},
    eps("kube-system", "kube-dns", [pods["coredns-7c65d6cfc9-4vxkq"], pods["coredns-7c65d6cfc9-m2rtd"]], [("dns-tcp", 53, "TCP"), ("dns", 53, "UDP"), ("metrics", 9153, "TCP")], "w8m4c"),
    eps("default", "mysql-a", [pods["mysql-a-0"]], [("mysql", 3306, "TCP")], "q7n2x"),
    eps("default", "mysql-b", [pods["mysql-b-0"]], [("mysql", 3306, "TCP")], "f5k9p"),
    eps("default", "mysql-a-headless", [pods["mysql-a-0"]], [("mysql", 3306, "TCP")], "h2v6r"),
    eps("default", "nginx", [pods["nginx-7c5ddbdf54-p8lwz"]], [("http", 80, "TCP")], "z4t8b"),
    eps("default", "web", [pods["web-6f4b8d9c7-t4hzp"]], [("http", 8080, "TCP")], "m9c3d"),
    eps("default", "legacy-api", [pods["legacy-api-0"]], [("http", 8080, "TCP")], "r6p2w"),
]
# A pod going away: not ready, still serving while it terminates.
slices[6]["endpoints"].append({"addresses": ["10.244.2.11"], "conditions": {"ready": False, "serving": True, "terminating": True},
    "nodeName": "node-1", "targetRef": {"kind": "Pod", "name": "web-6f4b8d9c7-old01", "namespace": "default", "uid": uid("old")}})

def order(p):
    return (p["metadata"]["namespace"], p["metadata"]["name"])
items = sorted(pods.values(), key=order) + sorted(services, key=order) + sorted(slices, key=order)
print(json.dumps({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}, indent=4))
