package conntrack

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tableMemory is where a table's ring and index live: mapped memory, off
// the Go heap. Both are pointer-free and sized by floods (up to 68 MiB at
// the default MaxWaited); on the heap they would count toward the
// collector's goal, which lets the heap grow to twice what is live, and a
// prune that shrinks them would give the memory back only when the
// scavenger gets to it. Mapped, they cost what they hold and go back to
// the kernel at once.
type tableMemory struct {
	ring, slots []byte // the mappings; nil for none (or heap fallback)
}

// newTableMemory is the memory of t, unmapped when t is collected.
func newTableMemory(t *table) *tableMemory {
	m := new(tableMemory)
	runtime.AddCleanup(t, (*tableMemory).free, m)
	return m
}

// mapArray is an array of n Ts in mapped memory, and its mapping; on the
// heap when the kernel refuses the mapping (the mapping is nil then).
// T must hold no pointers: the collector does not see mapped memory.
func mapArray[T any](n int) ([]T, []byte) {
	size := n * int(unsafe.Sizeof(*new(T)))
	if size == 0 {
		return nil, nil
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]T, n), nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n), b
}

// replace takes the new ring's and index's mappings and unmaps the old
// ones, which nothing refers to any more (resize has moved them).
func (m *tableMemory) replace(ring, slots []byte) {
	m.free()
	m.ring, m.slots = ring, slots
}

func (m *tableMemory) free() {
	for _, b := range [][]byte{m.ring, m.slots} {
		if b != nil {
			unix.Munmap(b) // it can fail only for a mapping it did not make
		}
	}
	m.ring, m.slots = nil, nil
}

// mapped is the bytes the table holds mapped.
func (m *tableMemory) mapped() int { return len(m.ring) + len(m.slots) }
