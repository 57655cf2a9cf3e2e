"""Example job kinds; ``jobctl demo`` runs ``check_order``."""
