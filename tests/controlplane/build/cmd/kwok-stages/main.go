// Command kwok-stages prints the node and pod stages kwok ships (its
// "fast" lifecycle: nodes Ready with their address and kubelet port, pods
// Running with an IP): since v0.8.0 kwok uses no stage unless given one.
package main

import (
	"fmt"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	"sigs.k8s.io/kwok/kustomize/stage/node/heartbeat"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

func main() {
	stages := []string{nodefast.DefaultNodeInit, heartbeat.DefaultNodeHeartbeat,
		podfast.DefaultPodReady, podfast.DefaultPodComplete, podfast.DefaultPodDelete}
	for _, s := range stages {
		fmt.Printf("---\n%s\n", strings.TrimSpace(s))
	}
}
