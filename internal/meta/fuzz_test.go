package meta

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadJSON: whatever a --metadata file holds, loading it gives an
// index or an error, never a panic.
func FuzzLoadJSON(f *testing.F) {
	data, err := os.ReadFile(incidentsFile)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"x"},"spec":{"clusterIPs":["10.96.3.3","fd96::3"],"ports":[{"port":53,"protocol":"UDP"}]}}`))
	f.Add([]byte(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"e","namespace":"x","labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv6","endpoints":[{"addresses":["fd44::5"]}],"ports":[{"port":53}]}`))
	f.Add([]byte(`{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"ports":[{"hostPort":99999}]}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := LoadJSON(data, "fuzz.json")
		if err == nil && idx == nil {
			t.Fatal("no index and no error")
		}
	})
}

// FuzzKubeconfig: whatever a --kubeconfig file holds, building the client
// configuration from it gives one or an error, never a panic.
func FuzzKubeconfig(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"))
	f.Add([]byte("clusters: [: not yaml"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := restConfig(path)
		if err == nil && cfg == nil {
			t.Fatal("no config and no error")
		}
	})
}
