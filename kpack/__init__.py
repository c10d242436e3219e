"""Knowledge Packs core: where packs live, what a pack folder holds, and the data contracts."""
