package fsdp

import (
	"fmt"
	"slices"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/model/llama"
)

// ReadRange fills dst with the flat-buffer elements [lo, lo+len(dst)) of
// the tensors prefix+<parameter> of checkpoint r, reading only the parts
// of the tensors that overlap the range. Runtime.Load takes it (bound to
// a reader and prefix) to load one rank's shards from a checkpoint of
// whole tensors, whatever layout wrote it.
func ReadRange(r *checkpoint.Reader, prefix string, cfg llama.Config, lo int, dst []float32) error {
	hi := lo + len(dst)
	for _, p := range cfg.Layout() {
		a, b := max(lo, p.Offset), min(hi, p.Offset+p.Size)
		if a >= b {
			continue
		}
		name := prefix + p.Name
		t, ok := r.Meta.Tensors[name]
		if !ok {
			return fmt.Errorf("checkpoint %s lacks %s", r.Dir, name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("checkpoint %s: %s has shape %v, the model wants %v", r.Dir, name, t.Shape, p.Shape)
		}
		if err := r.Read(name, a-p.Offset, dst[a-lo:b-lo]); err != nil {
			return err
		}
	}
	return nil
}
