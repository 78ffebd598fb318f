package trace

import "unsafe"

// Arena makes strings out of shared blocks: one allocation for many short
// strings (the endpoints the Encoder writes, a flow's explanation) instead
// of one each. A block lives as long as any string made from it; the
// strings of one block are written one after another, and a stream or
// the UI's store drops them in that order too. A block's bytes are never
// written again once a string holds them. The zero Arena uses blocks of
// DefaultArenaBlock bytes. Not safe for concurrent use.
type Arena struct {
	// BlockSize is the size of each block; a string over a quarter of it
	// is allocated alone.
	BlockSize int
	block     []byte
}

// DefaultArenaBlock is the zero Arena's block size.
const DefaultArenaBlock = 2048

func (a *Arena) blockSize() int {
	if a.BlockSize > 0 {
		return a.BlockSize
	}
	return DefaultArenaBlock
}

// String is string(b), made in the arena.
func (a *Arena) String(b []byte) string {
	return a.Append(len(b), func(dst []byte) []byte { return append(dst, b...) })
}

// Append is the string write appends to an empty slice, at most most
// bytes long, made in the arena.
func (a *Arena) Append(most int, write func([]byte) []byte) string {
	if most <= 0 {
		return string(write(nil))
	}
	if most > a.blockSize()/4 {
		return string(write(make([]byte, 0, most)))
	}
	if cap(a.block)-len(a.block) < most {
		a.block = make([]byte, 0, a.blockSize())
	}
	start := len(a.block)
	out := write(a.block)
	if len(out) == start {
		return ""
	}
	if cap(out) != cap(a.block) || len(out)-start > most {
		// write went past what it promised and out is a new array:
		// the block stays as it was.
		return string(out[start:])
	}
	a.block = out
	return unsafe.String(&a.block[start], len(out)-start)
}
