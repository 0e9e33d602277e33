package mlxrunner

// mediaItem (harness stub, used only when the copied files do not define it):
// the fields the prefix cache reads. The harness passes only non-causal items;
// their positions carry the fold value as key.
type mediaItem struct {
	pos    int
	length int
	fold   uint32
}
