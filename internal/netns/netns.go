// Package netns runs code on an OS thread switched into a network
// namespace: sockets it creates belong to that namespace for their whole
// life, and commands it starts inherit it.
package netns

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// On runs fn on the calling goroutine's thread switched into the namespace
// at path ("" runs fn in place), then switches the thread back and
// releases it. Retiring the thread instead (leaving it locked when the
// goroutine ends) kills the process's children: the parent-death signal
// follows the thread that started a child, and a process embedding the
// tracer (its tests: kube-apiserver, etcd and kube-proxy run with
// Pdeathsig) loses every child that thread happened to start. Only when
// switching back fails does the thread stay locked, so that the runtime
// ends it when the goroutine returns rather than reuse it in the wrong
// namespace: call On on a goroutine of its own, or use Do.
func On(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer unix.Close(target)
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	ferr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// Still locked: the runtime ends this thread with its goroutine.
		return errors.Join(ferr, fmt.Errorf("return from network namespace %s: %w", path, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Do is On on a goroutine of its own, waited for.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- On(path, fn) }()
	return <-errc
}
