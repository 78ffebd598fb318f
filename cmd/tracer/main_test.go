package main

import (
	"os"
	"testing"
)

// asTracerEnv makes the test binary run as the tracer itself: tests that
// run the tracer as another user, or in the VM matrix where there is no Go
// toolchain to build it, exec their own binary with it set.
const asTracerEnv = "TRACER_TEST_AS_TRACER"

func TestMain(m *testing.M) {
	if os.Getenv(asTracerEnv) == "1" {
		os.Exit(runMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}
