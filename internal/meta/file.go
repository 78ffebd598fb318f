package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// fileHint tells the user how to produce a file LoadFile reads.
const fileHint = "want the output of kubectl get pods,services,endpointslices -A -o json"

// LoadFile reads pod and Service metadata from the JSON that
// `kubectl get pods,services,endpointslices -A -o json` prints: a v1 List of
// mixed kinds. A typed list (PodList, ...) or a single object is accepted
// too. Errors name the file and the offending item; they are bad input
// (exit code 2), not runtime failures.
func LoadFile(path string) (Index, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read metadata: %w", err)
	}
	return LoadJSON(data, path)
}

// LoadJSON is LoadFile for JSON already in memory (the lab builds it);
// name says where it came from in errors.
func LoadJSON(data []byte, name string) (Index, error) {
	st := newStore(0, nil)
	if err := loadJSON(st, data); err != nil {
		return nil, fmt.Errorf("metadata %s: %w", name, err)
	}
	return &fileIndex{store: st}, nil
}

// fileIndex is a store filled once from a file: complete by construction.
type fileIndex struct{ *store }

func (*fileIndex) Synced() bool       { return true }
func (*fileIndex) Warnings() []string { return nil }

// typeHead is the part of any object or list that says what it is.
type typeHead struct {
	APIVersion string                           `json:"apiVersion"`
	Kind       string                           `json:"kind"`
	Metadata   struct{ Namespace, Name string } `json:"metadata"`
	Items      []json.RawMessage                `json:"items"`
}

func loadJSON(st *store, data []byte) error {
	var head typeHead
	if err := json.Unmarshal(data, &head); err != nil {
		return jsonError(data, err)
	}
	switch head.Kind {
	case "List", "PodList", "ServiceList", "EndpointSliceList":
		// Items of a typed list straight from the API have no kind of their
		// own; kubectl's List always names it.
		implied := strings.TrimSuffix(head.Kind, "List")
		for i, raw := range head.Items {
			if err := loadItem(st, raw, implied); err != nil {
				return fmt.Errorf("items[%d]%w", i, err)
			}
		}
		return nil
	case "Pod", "Service", "EndpointSlice":
		if err := loadItem(st, data, ""); err != nil {
			return fmt.Errorf("object%w", err)
		}
		return nil
	case "":
		return errors.New("not a Kubernetes object: no kind (" + fileHint + ")")
	default:
		return fmt.Errorf("kind %s is not supported (%s)", head.Kind, fileHint)
	}
}

// loadItem decodes one object; its errors start with " (Kind ns/name): " or
// ": " so that the caller can prefix the item's position.
func loadItem(st *store, raw json.RawMessage, implied string) error {
	var head typeHead
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf(": %w", err)
	}
	kind := head.Kind
	if kind == "" {
		kind = implied
	}
	what := ""
	if kind != "" {
		what = " (" + kind
		if head.Metadata.Name != "" {
			what += " " + head.Metadata.Namespace + "/" + head.Metadata.Name
		}
		what += ")"
	}
	if err := checkAPIVersion(kind, head.APIVersion); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var err error
	switch kind {
	case "Pod":
		var p corev1.Pod
		if err = json.Unmarshal(raw, &p); err == nil {
			var info *PodInfo
			if info, err = podInfo(&p); err == nil {
				st.upsertPod(info)
			}
		}
	case "Service":
		var s corev1.Service
		if err = json.Unmarshal(raw, &s); err == nil {
			var info *ServiceInfo
			if info, err = serviceInfo(&s); err == nil {
				st.upsertService(info)
			}
		}
	case "EndpointSlice":
		var es discoveryv1.EndpointSlice
		if err = json.Unmarshal(raw, &es); err == nil {
			var si *sliceInfo
			if si, err = sliceInfoOf(&es); err == nil && si != nil {
				st.upsertSlice(si)
			}
		}
	case "":
		err = errors.New("no kind")
	default:
		err = fmt.Errorf("kind %s is not supported (%s)", kind, fileHint)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// checkAPIVersion refuses versions whose shape differs from the one decoded
// (discovery.k8s.io/v1beta1 EndpointSlices had topology, not nodeName).
func checkAPIVersion(kind, apiVersion string) error {
	if apiVersion == "" {
		return nil // an item of a typed list
	}
	want := "v1"
	if kind == "EndpointSlice" {
		want = discoveryv1.SchemeGroupVersion.String()
	}
	if kind != "" && apiVersion != want {
		return fmt.Errorf("apiVersion %s is not supported, want %s", apiVersion, want)
	}
	return nil
}

// jsonError adds the line of a syntax error: byte offsets are useless in a
// file of kubectl output.
func jsonError(data []byte, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
		return fmt.Errorf("line %d: %w", line, err)
	}
	return err
}
