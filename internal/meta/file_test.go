package meta

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadFileIncidents(t *testing.T) {
	idx, err := LoadFile(incidentsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !idx.Synced() || len(idx.Warnings()) != 0 {
		t.Errorf("file index: synced %v, warnings %q; want synced without warnings", idx.Synced(), idx.Warnings())
	}
	checkIncidents(t, idx, fixtureNow, true)
}

func TestLoadFileTypedListAndSingleObject(t *testing.T) {
	dir := t.TempDir()
	// A PodList straight from the API: its items carry no kind.
	list := filepath.Join(dir, "pods.json")
	write(t, list, `{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"9"},"items":[
	 {"metadata":{"name":"a","namespace":"x","creationTimestamp":"2026-11-28T08:00:00Z"},
	  "spec":{"nodeName":"node-2","containers":[{"name":"c","image":"i","ports":[{"containerPort":53,"hostPort":5353,"protocol":"UDP"}]}]},
	  "status":{"phase":"Running","podIP":"10.244.1.40"}}]}`)
	idx, err := LoadFile(list)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := idx.PodByHostPort("udp", 5353, "node-2")
	if !ok || p.Name != "a" || len(p.IPs) != 1 || p.IPs[0].String() != "10.244.1.40" {
		t.Errorf("PodByHostPort(udp, 5353) from a PodList = %+v, %v", p, ok)
	}
	one := filepath.Join(dir, "svc.json")
	write(t, one, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"x"},
	 "spec":{"type":"ClusterIP","clusterIP":"10.96.3.3","ports":[{"port":8125,"protocol":"UDP","targetPort":8125}]}}`)
	idx, err = LoadFile(one)
	if err != nil {
		t.Fatal(err)
	}
	if s, sp, ok := idx.ServiceByAddr(mustAddr("10.96.3.3"), 8125, "udp", false, time.Time{}); !ok || s.Name != "s" || sp.Port != 8125 {
		t.Errorf("ServiceByAddr from a single Service = %+v %+v %v", s, sp, ok)
	}
}

func TestLoadFileErrors(t *testing.T) {
	good, err := os.ReadFile(incidentsFile)
	if err != nil {
		t.Fatal(err)
	}
	pod := func(ip string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns"},"spec":{"containers":[]},"status":{"podIPs":[{"ip":"` + ip + `"}]}}`
	}
	cases := []struct {
		name, data string
		want       []string // substrings of the error, after the file name
	}{
		{"truncated", string(good[:len(good)/2]), []string{"unexpected end of JSON input"}},
		{"syntax", "{\"kind\":\"List\",\n\"items\": [}", []string{"line 2", "invalid character"}},
		{"not-json", "pods:\n- name: x\n", []string{"invalid character"}},
		{"no-kind", `{"items":[]}`, []string{"no kind", "kubectl get pods,services,endpointslices -A -o json"}},
		{"wrong-kind", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}`, []string{"kind Deployment is not supported"}},
		{"wrong-item-kind", `{"apiVersion":"v1","kind":"List","items":[` + pod("10.244.1.9") + `,{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"ns"}}]}`,
			[]string{"items[1] (ConfigMap ns/cm): kind ConfigMap is not supported"}},
		{"bad-pod-ip", `{"apiVersion":"v1","kind":"List","items":[` + pod("10.244.1.9") + `,` + pod("10.244.1.300") + `]}`,
			[]string{`items[1] (Pod ns/p): status.podIPs[0]: bad IP "10.244.1.300"`}},
		{"bad-field-type", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"ns"},"spec":{"ports":[{"port":"eighty"}]}}]}`,
			[]string{"items[0] (Service ns/s): json: cannot unmarshal"}},
		{"bad-cluster-ip", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"ns"},"spec":{"clusterIPs":["10.96.0.x"]}}]}`,
			[]string{`items[0] (Service ns/s): spec.clusterIPs[0]: bad IP "10.96.0.x"`}},
		{"bad-endpoint", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"e","namespace":"ns","labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv4","endpoints":[{"addresses":["10.244.1.9"]},{"addresses":["bogus"]}],"ports":[{"port":80}]}]}`,
			[]string{`items[0] (EndpointSlice ns/e): endpoints[1].addresses[0]: bad IP "bogus"`}},
		{"old-endpointslice", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"discovery.k8s.io/v1beta1","kind":"EndpointSlice","metadata":{"name":"e","namespace":"ns"}}]}`,
			[]string{"items[0] (EndpointSlice ns/e): apiVersion discovery.k8s.io/v1beta1 is not supported"}},
		{"item-not-object", `{"apiVersion":"v1","kind":"List","items":[42]}`, []string{"items[0]: json: cannot unmarshal number"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), c.name+".json")
			write(t, path, c.data)
			idx, err := LoadFile(path)
			if err == nil {
				t.Fatalf("LoadFile(%s) = %v, want an error", c.name, idx)
			}
			if !strings.HasPrefix(err.Error(), "metadata "+path+": ") {
				t.Errorf("error %q does not start with %q", err, "metadata "+path+": ")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("LoadFile(missing) = %v, want an error naming the file", err)
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoadFileAPIServer reads the same cluster as a real API server printed
// it (testdata/metadata/README.md).
func TestLoadFileAPIServer(t *testing.T) {
	idx, err := LoadFile("../../testdata/metadata/apiserver.json")
	if err != nil {
		t.Fatal(err)
	}
	checkIncidents(t, idx, time.Now(), false)
	eps := idx.EndpointsOf(ServiceRef{Namespace: "default", Name: "kubernetes"})
	if s, sp, ok := idx.ServiceByAddr(mustAddr("10.96.0.1"), 443, "tcp", false, time.Time{}); !ok || s.Name != "kubernetes" || sp.TargetPort != "26443" || len(eps) != 1 {
		t.Errorf("the API server's own Service = %+v %+v %v, endpoints %+v", s, sp, ok, eps)
	}
}
