// Package mlx (harness stub): the few names of Ollama's MLX bindings that the
// prefix cache and its cache interface mention. The harness never evaluates
// arrays: Ollama's test fakes hold token lists, so nothing here computes.
// Written for this project; it replaces x/mlxrunner/mlx in the build module.
package mlx

import "fmt"

// Array stands in for an MLX array handle; fakes return none.
type Array struct{}

func (a *Array) NumBytes() int { return 0 }

// AsyncEval would schedule evaluation; there is nothing to evaluate.
func AsyncEval(arrays ...*Array) {}

// Eval, Sweep, Pin, Unpin, ClearCache: no-ops (kept for checkouts that call them).
func Eval(arrays ...*Array)  {}
func Sweep()                 {}
func Pin(arrays ...*Array)   {}
func Unpin(arrays ...*Array) {}
func ClearCache()            {}

// Bytes prints a byte count.
type Bytes int

func (b Bytes) String() string { return fmt.Sprintf("%d B", int(b)) }

func PrettyBytes(n int) Bytes { return Bytes(n) }
