// Package logutil (harness stub): trace logging is dropped.
// Written for this project; it replaces Ollama's logutil in the build module.
package logutil

import (
	"context"
	"log/slog"
)

const LevelTrace slog.Level = -8

func Trace(msg string, args ...any)                             {}
func TraceContext(ctx context.Context, msg string, args ...any) {}
