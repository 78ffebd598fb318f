package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// In the container image the tracer binary is also iptables-save and
// ip6tables-save: a node's rules are in the legacy backend or in nf_tables,
// and only the host knows which. Like kube-proxy's image (the
// iptables-wrappers of kubernetes-sigs), the wrapper asks both backends
// and runs the one the node uses: the one holding kubelet's and
// kube-proxy's hint chains, else the one with more rules, nf_tables on a
// tie.
var iptablesSaves = map[string]bool{"iptables-save": true, "ip6tables-save": true}

// hintChains are the chains kubelet and kube-proxy create in the backend
// they use, in every table save prints.
var hintChains = [][]byte{[]byte(":KUBE-IPTABLES-HINT "), []byte(":KUBE-KUBELET-CANARY ")}

// runIPTablesWrapper execs the backend's name (iptables-save or
// ip6tables-save) with args; it returns only when that fails.
func runIPTablesWrapper(name string, args []string) int {
	mode := pickBackend(saveOutput("xtables-legacy-multi", name), saveOutput("xtables-nft-multi", name))
	multi, err := exec.LookPath("xtables-" + mode + "-multi")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (tracer's wrapper): %v\n", name, err)
		return 1
	}
	err = syscall.Exec(multi, append([]string{name}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "%s (tracer's wrapper): exec %s: %v\n", name, multi, err)
	return 1
}

// saveOutput is what one backend's save prints, nothing when it fails
// (its module not loaded, its binary missing).
func saveOutput(multi, name string) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, multi)
	cmd.Args[0] = name // the multi-call binary runs the applet its argv[0] names
	out, _ := cmd.Output()
	return out
}

// pickBackend says "legacy" or "nft" from the two backends' save output.
func pickBackend(legacy, nft []byte) string {
	hinted := func(out []byte) bool {
		for _, h := range hintChains {
			if bytes.Contains(out, h) {
				return true
			}
		}
		return false
	}
	switch {
	case hinted(nft):
		return "nft"
	case hinted(legacy):
		return "legacy"
	case rules(legacy) > rules(nft):
		return "legacy"
	}
	return "nft"
}

func rules(save []byte) int {
	n := 0
	for _, line := range bytes.Split(save, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("-A ")) {
			n++
		}
	}
	return n
}

// asIPTablesSave: called as iptables-save or ip6tables-save (a link in
// the image), the binary is the wrapper.
func asIPTablesSave() (string, bool) {
	name := filepath.Base(os.Args[0])
	return name, iptablesSaves[name]
}
