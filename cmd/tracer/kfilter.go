package main

import "github.com/tracer-dev/tracer/internal/loader"

// applyKernelFilter pushes the simple terms of a filter expression into the
// kernel side.
func applyKernelFilter(cfg *loader.Config, expr string) error {
	return nil
}
