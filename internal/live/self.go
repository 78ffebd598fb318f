package live

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// SelfUsage is what the tracer's own process has cost the node: an
// on-call engineer running it on a node in trouble must see that the
// tracer is not what hurts it.
type SelfUsage struct {
	// CPU is the process's user and system time since it started.
	CPU time.Duration
	// RSS is its resident size now, PeakRSS the most it has been; 0 when
	// the kernel did not say.
	RSS, PeakRSS uint64
}

// ReadSelfUsage reads the process's usage from the kernel: getrusage for
// the CPU time and the peak, /proc/self/statm for the size now.
func ReadSelfUsage() SelfUsage {
	var u SelfUsage
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		u.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		u.PeakRSS = uint64(ru.Maxrss) << 10 // Linux gives KiB
	}
	u.RSS = residentNow()
	return u
}

// residentNow is the second field of /proc/self/statm (resident pages)
// in bytes, 0 when it cannot be read.
func residentNow() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
